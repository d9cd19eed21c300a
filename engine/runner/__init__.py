"""engine/runner"""
