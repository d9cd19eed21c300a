"""replay/workloads"""
