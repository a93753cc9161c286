"""SIE in Python: an inference engine for embeddings, reranking and entity extraction."""
