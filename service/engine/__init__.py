"""The engines: how requests for one model are queued, batched and run on onnxruntime.

Both follow one pattern. A plain state object holds the queue and the batch-forming rules
(``batching.BatchState``: whole requests, at most ceil(queued / instances) images a batch;
``scheduler.Scheduler``'s waiting and running rows: sequences join and leave between decoder
steps, a beam takes ``beam`` rows). Workers that own the compute take their work from that state
(one thread per model instance for classification; one asyncio task, with one worker thread, for
translation), and the model-specific work is a task adapter's (``Classifier``: prepare, forward,
rank; ``Translator``: tokenise, encoder, decoder step, result). Admission (overload, shutdown) and
failures are answered the same way by both (``admission.py``); a request whose client left is
dropped before compute (classification) or leaves the running batch at the next step
(translation).
"""
