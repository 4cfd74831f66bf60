"""abft"""
