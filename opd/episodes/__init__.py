"""Episodes and what is made of them: an episode's turns and targets, the chat format's token ids, demonstrations
as fixed episodes, and MiniMind's scoring of an episode."""
