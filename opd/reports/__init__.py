"""What the entries draw and tabulate: the evaluation's table and charts, a run's training curves."""
