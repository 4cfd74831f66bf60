"""conv"""
