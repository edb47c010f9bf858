"""Draft distillation with PyTorch Lightning: a student LM trained on the frozen target's distributions."""
