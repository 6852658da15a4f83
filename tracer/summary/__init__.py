"""Gradient summaries: statistics and thumbnails computed on the tensor's own device inside the hooks and
fetched to the host once per step (`Summariser`), with an optional C kernel for CPU tensors.

    summariser  `Summariser`: what the hooks call, and `finalize`, the one fetch per step
    stats       the statistics (`raw_stats` on the device, named on the host)
    thumbnails  the block-mean thumbnail (NOTE [Thumbnail views])
    sparse      sparse gradients, never made dense
    fastpath    the kernel's one-pass path, planned once per shape
    budget      the per-step thumbnail budget (`Tracer(thumb_budget=...)`)
    kernel      finding and loading the built kernel (`_fastsum*.c`, compiled at install time)
    staged      device gradients' statistics computed together (NOTE [Staged statistics])
    bfloat16    thumbnails at bfloat16's precision, as the native recorder's arena keeps them
"""
