"""The public ops: each validates its arrays, plans a specialization and binds the compiled
kernels to their constant arguments once per argument key (a prepared call, `bound.bound_launch`);
a call then builds only its pointers, tensor maps and workspace and launches them
(`runtime.CallValues.launch`)."""
