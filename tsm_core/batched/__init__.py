"""batched"""
