"""Algorithm-based fault tolerance (ABFT) for GEMM: checksums encoded by
multiplying with a tall-and-skinny checksum weight matrix, then used to detect
and correct errors in the product.

Not written yet: tracked by open issue 4.
"""
