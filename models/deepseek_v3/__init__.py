"""The DeepSeek-V3 family: MLA attention, shared and group-limited routed experts, multi-token prediction."""
