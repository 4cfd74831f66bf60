"""Applications built on tsm_core's public functions: k-means, ABFT, Inception.

Each lives in its own subpackage and imports ``tsm_core`` only, never another
app's internals (``tsm_apps._cli`` holds what their command lines share).
Installed as ``tsm_apps``: the folder is ``apps/`` in the repository.
"""
