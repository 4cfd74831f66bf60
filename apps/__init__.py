"""Applications built on tsm_core's public functions: k-means, ABFT, Inception.

Each lives in its own subpackage and imports ``tsm_core`` only, never another
app's internals. None is built yet; each subpackage names its open issue.
"""
