"""Pricing a run: the hardware profile (its data model and measurement), the calibrated cost model,
and draft.k's policies built from them. Above core/, runtime/ and drafts/; below study/."""
