"""kmeans"""
