"""The quality check (quality_check.py): does a serving profile keep accuracy on olmOCR-Bench?"""
