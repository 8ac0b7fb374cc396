"""The MiniMind model layer: MiniMind-3 checkpoints as transformers models (``model.py``; what a model config block
describes, torch-free, in ``spec.py``), its tokenizer, device and precision.

Used by training, evaluation, the embedded server (``launch/``) and regen; nothing here knows about training.
"""
