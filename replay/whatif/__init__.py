"""replay/whatif"""
