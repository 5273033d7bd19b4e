#!/bin/bash
ecko "yonder"
