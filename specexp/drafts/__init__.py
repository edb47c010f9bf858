"""Draft strategies, one per file, all behind specexp.drafts.base.Drafter."""
