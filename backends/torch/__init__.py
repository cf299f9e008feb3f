"""The PyTorch backend: capture through a TorchFunctionMode plus global module hooks."""
