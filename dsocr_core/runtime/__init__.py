"""What runs a page: inputs (image + prompt -> tensors), the tokenizer, the engines behind one interface, the one
greedy generator, the session, timing and FLOP counting."""
