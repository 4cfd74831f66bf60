"""Batched irregular GEMM and its use on the convolutions of GoogLeNet
Inception modules (many small GEMMs of different shapes in one launch).

Not written yet: tracked by open issue 5.
"""
