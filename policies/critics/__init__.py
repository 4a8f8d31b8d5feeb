"""Value heads and VLM process-reward critics."""
