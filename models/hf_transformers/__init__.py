"""The Hugging Face backend: any decoder-only causal LM transformers knows, run by transformers' own modelling code."""
