"""The model repository: `rmscore export` writes it (ONNX graph, checkpoint, tokenizer, manifest
with golden scores), `repository` reads it, `default_model` builds the embedded MiniLM reward model."""
