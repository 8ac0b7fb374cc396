"""How a conversation is regenerated: its requests turn by turn, each reply checked and turned into a row."""
