"""veRL's verl.experimental.dataset import path."""
