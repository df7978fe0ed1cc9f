"""kvcore's workload replayer: drives a KV-cache manager the way an inference engine does."""
