"""Draft strategies, one per file, each behind the contract in specexp.core.interface (Drafter and its
sub-protocols), each registered by its conf/draft/NAME.yaml (registry.py reads their cards; build.py
makes one for a target). What the strategies are built of lives in parts/."""
