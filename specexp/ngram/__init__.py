"""Corpus-trained n-gram drafts: a Kneser-Ney LM and a suffix-array datastore (REST)."""
