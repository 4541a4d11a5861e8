"""Text in and out: the standalone preprocessing and postprocessing models and the tokenizing code the fronts share."""
