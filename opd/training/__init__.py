"""The one training loop and what it is made of: data order, loss, optimization, checkpoints and resume, the
processes of a torchrun job, the models a run starts from, its out_dir, logs and signals."""
