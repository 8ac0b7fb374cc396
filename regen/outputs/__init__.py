"""What a run writes: its output and error files, the manifest, the counters, the progress bar and the summary."""
