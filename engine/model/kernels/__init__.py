"""engine/model/kernels"""
