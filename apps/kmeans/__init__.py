"""K-means clustering on the GPU, with the point-to-centroid distances (n points by
k centroids, k small: the TSM2R shape) computed by tall-and-skinny kernels, as an
estimator in scikit-learn's style.

>>> from tsm_apps.kmeans import TSMKMeans
>>> TSMKMeans(n_clusters=3).get_params()["n_clusters"]
3

``python -m tsm_apps.kmeans --dataset digits --n-clusters 10`` runs it on a dataset;
``python -m tsm_apps.kmeans.bench`` measures it against torch + cuBLAS and scikit-learn.
"""

from tsm_apps.kmeans._estimator import TSMKMeans

__all__ = ["TSMKMeans"]
