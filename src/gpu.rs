//! Choosing the compute device. Users get a CUDA device or a clear error, never a silent CPU run.
