"""The reference RL loop on sandfleet: async actors, a learner with off-policy correction, real tasks."""
