"""hyperpar.torch: a hyperpar plan applied to a transformers model under torch.distributed (DTensor)."""
