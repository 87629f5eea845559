"""Labs built around the product for tests and benchmarks (namespaces, nftables NATs); not part of it."""
