"""Where rows come from: a dataset's rows (hub or local file), each read into a conversation under its primary id."""
