"""Where models come from: the zoo of small models (``zoo:NAME``), the corpus of real
architectures (``corpus:NAME``), synthetic graphs, Hypothesis strategies, export_llama's tiny
decoder, the optimum-executorch recipe, and the command line's model sources
(:mod:`composer.models.model_source`: ``zoo:NAME``, ``corpus:NAME``, ``file.pt2``,
``pkg.mod:factory``)."""
