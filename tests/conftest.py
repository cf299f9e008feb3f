import warnings

# A plugin that fails to load warns; the tests check backends one at a time.
warnings.filterwarnings("ignore", message="TorchLens backend plugin", category=RuntimeWarning)
