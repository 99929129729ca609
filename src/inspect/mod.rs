//! What a model is, read from its files without loading the weights.
