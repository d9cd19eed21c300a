"""replay/whatif/cost"""
