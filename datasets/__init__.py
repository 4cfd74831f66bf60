"""Data for the applications and benchmarks: generators and loaders of the
inputs that the k-means, ABFT and Inception apps run on.

Not written yet: tracked by the apps' open issues (k-means issue 3, ABFT
issue 4, Inception and batched GEMM issue 5).
"""
