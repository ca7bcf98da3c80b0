"""veRL's import paths for the user-facing base classes verlx keeps elsewhere (a launch's own code that imports
from `verl.experimental...` works with `verl` replaced by `verlx`)."""
