"""tenant"""
