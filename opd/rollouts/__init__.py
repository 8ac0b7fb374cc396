"""Who writes an episode's tokens: batched multi-turn rollouts in MiniMind's tool world, their sampling seeds, a
guided rollout's behaviour policy, and the teacher's own cached rollouts."""
