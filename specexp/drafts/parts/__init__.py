"""What the draft strategies are built of, apart from the strategies themselves: argument checks and
proposal helpers (base), the models they run (feature heads: EAGLE's, Medusa's; exit heads), token
trees grown by confidence, a context's n-gram index, int8 linears and vocabulary maps between tokenizers."""
