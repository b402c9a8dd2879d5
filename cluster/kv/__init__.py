"""The KV layer (paper 000 §4.3, App. E.1–E.2): block hashing, the cluster-wide KV directory,
the branch table with its counts R_{b,n}, node tier caches and their eviction orders."""
