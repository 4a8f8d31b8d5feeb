"""Real-robot bridge: Franka env, safety layer, policy server/client."""
