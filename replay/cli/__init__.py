"""replay/cli"""
