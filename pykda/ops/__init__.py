"""The public ops: each validates its arrays, plans a specialization, asks the runtime for the
compiled kernel, builds tensor maps and workspace, and launches."""
