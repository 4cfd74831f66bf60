"""K-means clustering on the GPU, with tsm's tall-and-skinny GEMM computing the
point-to-centroid distances (n points by k centroids, k small), as an estimator
in scikit-learn's style.

Not written yet: tracked by open issue 3.
"""
