"""The line through the stages: plan(), compose() and measured placement's composing."""
