"""Generation on a converted decoder graph (DESIGN §3): `sampling` (SamplingParams, the Sampler), `stopping` (the
StopChecker: stop strings, stop tokens, max_tokens, incomplete UTF-8), `kv_cache` (the key/value cache and the
left-padded batch cache), `decoder_run` (one run through IO binding, the cache left on the device),
`batching_decoder` (continuous batching on each model's own thread), `greedy_loop` (the plain decode loop, the raw
reference), `chat_template` (chat messages to a prompt) and `call` (one ProcessGenerate call as the GenerateEvents
the sidecar obeys). The causal-LM adapter (`sie.worker.adapters.causal_lm`) ties them to a loaded model. Import the
modules by name: this package re-exports nothing.
"""
