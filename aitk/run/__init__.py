"""One training job, from a loaded config to its exit code.

    job.py            run_job: signals, the run record, the status file, the error
                      boundary; each process of the job in turn
    process.py        one process as a short sequence of named steps:
      assembly.py       device, model, datasets, adapter + optimizer + batch source
      caches.py         latents and text embeddings, encoded once or per batch
      saving.py         a save (checkpoint, LoRA files, pruning) and a resume
      train.py          the one-screen training loop
    signals.py        Ctrl+C / SIGTERM / SIGHUP: finish the step, save, exit 130
    output.py         the output folder: its lock, its file names, only ours touched
    checkpoint.py     checkpoint folders: save, validate, find the resumable one, prune
    optim.py          the optimizer and lr_at(step)
    sampling.py       previews through the model's hooks
    metrics.py        progress on the console and the loss log
    status.py         the status file a watcher (the web UI) reads
    ownership.py      how the trainer recognises the files it wrote
    distributed.py    data-parallel ranks under torchrun; torchrun.py starts them
    provenance.py     where a run came from (also `manager info`); stdlib only

Importing this package imports nothing: `run.py --check` and the manager import single
light modules from it (status, torchrun, provenance).
"""
